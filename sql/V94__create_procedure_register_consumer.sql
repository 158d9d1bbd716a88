-- Registers a consumer of a feed, so that its saved cursors hold purge_feed back (V93 says
-- why a saved cursor alone does not). Idempotent: returns one row, newly_registered, 1 when
-- this call registered it and 0 when it already was.
-- Who may: whoever may execute it, which the bundle grants to no one: db_owner (and dbo),
-- like setup_feed and purge_feed, or a role a db_owner grants EXECUTE on this procedure.
-- A member of only a feed's readers role gets the permission error (229): the decision to
-- keep events for a consumer is the feed's administrator's, not any reader's.
-- The consumer may not have saved a cursor yet (register it before it starts): its first
-- save (save_cursor) makes it the saving user's, as always, and from then on its cursors
-- hold the purge back. changefeed.consumer_lag shows holds_retention for every saved cursor.
-- Runs in the caller's transaction when there is one (under IMPLICIT_TRANSACTIONS ON too,
-- which the client commits, as save_cursor does), else in one of its own.
-- The feed lookup and the insert are one atomic step with teardown_feed: the feed's registry
-- key is read with an update lock kept to the transaction's end, so a teardown of the feed
-- waits for the registration (and then deletes it with the feed's row) or came first, and
-- this call finds no feed: 51006, never the foreign key's error 547.
create or alter procedure [changefeed].[register_consumer]
    @consumer nvarchar(4000),
    @feed nvarchar(257)
as
begin
    set nocount, xact_abort on;

    declare @feed_id int;
    declare @registered int;
    declare @message nvarchar(2048);
    declare @own_transaction bit = 0;

    -- The names save_cursor accepts (V66), so that every consumer can be registered and no
    -- name is cut to another consumer's.
    if @consumer is null or datalength(@consumer) = 0 or datalength(@consumer) / 2 > 200
        or datalength(@consumer) <> datalength(rtrim(@consumer))
        throw 51110, N'register_consumer: @consumer must be a name of 1 to 200 UTF-16 code units (an emoji takes two) that does not end with a space, as save_cursor requires.', 1;

    -- The reads below must see rows committed since a caller's SNAPSHOT transaction began.
    -- Reverts on return.
    set transaction isolation level read committed;

    begin try
        -- @@options & 2: IMPLICIT_TRANSACTIONS. Off and no transaction: an own one, since the
        -- lookup's lock must last until the insert is committed.
        if @@trancount = 0 and (@@options & 2) = 0
        begin
            -- Already off here; said for the reader (a begin under ON opens two levels).
            set implicit_transactions off;
            begin transaction;
            set @own_transaction = 1;
        end;

        -- Names never contain a dot (parse_feed_name), so parsename splits @feed exactly; the
        -- two parts seek feeds_name_uq. UPDLOCK, HOLDLOCK on that key (locking under
        -- READ_COMMITTED_SNAPSHOT too): teardown_feed's delete of the row seeks the same key
        -- with an update lock first, so it waits here before it has locked anything of the
        -- feed (a shared lock would let it take the row, then wait for this key while the
        -- insert's foreign-key check waits for the row: 1205). save_cursor's shared lock on
        -- the key is compatible; two registrations of one feed take turns. When no feed has
        -- the name, the key range stays locked instead, until this transaction ends.
        select @feed_id = feed_id
        from changefeed.feeds with (updlock, holdlock)
        where
            schema_name = parsename(@feed, 2)
            and table_name = parsename(@feed, 1)
            and parsename(@feed, 3) is null;
        if @feed_id is null
        begin
            set @message = N'register_consumer: ''' + isnull(@feed, N'(null)')
                + N''' is not a feed. Pass the feed''s event table as ''schema.table''.';
            throw 51006, @message, 1;
        end;

        -- UPDLOCK, SERIALIZABLE: two registrations of one consumer at once insert one row, the
        -- other waits for it and finds it, instead of failing on the primary key (2627).
        insert into changefeed.registered_consumers (feed_id, consumer, registered_by)
        select
            @feed_id,
            @consumer,
            database_principal_id()
        where not exists (
            select 1
            from changefeed.registered_consumers with (updlock, serializable)
            where feed_id = @feed_id and consumer = @consumer
        );
        set @registered = @@rowcount;

        if @own_transaction = 1
            commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;

    select convert(bit, @registered) as newly_registered;
end
