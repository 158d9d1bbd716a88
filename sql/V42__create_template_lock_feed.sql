-- lock_feed for serialized-writer feeds, written as the template feed's procedure.
-- A writer calls it inside its transaction, before inserting its events:
--   1. takes an exclusive, transaction-owned applock for (feed, shard), waiting at most
--      @lock_timeout_ms (-1: as long as it takes). Every writer of the shard queues here
--      until the holder commits or rolls back, so commit order is ULID order;
--   2. reserves 10^11 ULIDs from the shard's state row (changefeed.ulid_at, the allocator
--      of outbox mode), updating the row (locked until commit as well);
--   3. returns the first ULID (@ulid, and its parts @ulid_high, @ulid_low) and records the
--      range in the session context for [changefeed].[ulid:S.T](@i) to hand out.
-- The applock rather than waiting on the state row's lock: its timeout is a parameter, and
-- a timeout or deadlock comes back as a result code we turn into error 51202.
-- A session holding the lock blocks every writer of the shard until it ends: see POWEROFF.md.
create or alter procedure [changefeed].[lock_feed:changefeed.__template_serialized__]
    @shard_id int = 0,
    @time_hint datetime2(3) = null,
    @lock_timeout_ms int = -1,
    @ulid binary(16) = null output,
    @ulid_high binary(8) = null output,
    @ulid_low bigint = null output
as
begin
    set nocount, xact_abort on;

    if @@trancount = 0
        throw 51200, N'lock_feed must be called inside the writer''s transaction: the shard stays locked until that transaction ends, which is what keeps commit order equal to ULID order. Begin a transaction first.', 1;
    if @shard_id is null
        throw 51201, N'lock_feed: @shard_id is null. Pass the shard (0 for an unsharded feed).', 1;
    if @lock_timeout_ms is null or @lock_timeout_ms < -1
        throw 51201, N'lock_feed: @lock_timeout_ms must be -1 (wait as long as it takes) or a number of milliseconds >= 0.', 1;

    -- Literals the generator fills with the feed's name; not object_id(), which inside a
    -- procedure answers with the caller's metadata visibility (NULL for a writer login).
    -- The context key is at most 16 + 109 characters, within sysname's 128.
    declare @lock_resource nvarchar(255) = concat(
        N'changefeed:lock_feed:changefeed.__template_serialized__:', @shard_id
    );
    declare @context_key sysname = N'changefeed.ulid:changefeed.__template_serialized__';
    declare @epoch datetime2(3) = convert(datetime2(3), '19700101', 112);
    declare @hint datetime2(3) = isnull(@time_hint, sysutcdatetime());
    declare @lock_result int;
    declare @message nvarchar(2048);
    declare @state_ms bigint;
    declare @state_high binary(8);
    declare @state_next bigint;
    declare @range binary(24);

    exec @lock_result = sys.sp_getapplock
        @Resource = @lock_resource,
        @LockMode = 'Exclusive',
        @LockOwner = 'Transaction',
        @LockTimeout = @lock_timeout_ms;
    if @lock_result < 0
    begin
        set @message = concat(
            N'lock_feed: shard ', @shard_id, N' is locked by another writer''s transaction and',
            N' the lock was not granted within @lock_timeout_ms = ', @lock_timeout_ms,
            N' (sp_getapplock returned ', @lock_result,
            N'; -1 timeout, -2 cancelled, -3 deadlock victim). Your transaction was rolled back; retry it.'
        );
        throw 51202, @message, 1;
    end;

    select
        @state_ms = last_ms,
        @state_high = ulid_high,
        @state_next = next_counter
    from [changefeed].[state:changefeed.__template_serialized__] with (updlock, holdlock)
    where shard_id = @shard_id;

    -- One row of the allocator: a later millisecond starts a new high part and a random
    -- counter (bit 62 cleared); otherwise the range continues the shard's counter.
    select @ulid = a.ulid
    from changefeed.ulid_at(
        case when @hint < @epoch then 0 else datediff_big(millisecond, @epoch, @hint) end,
        1,
        1,
        @state_ms,
        @state_high,
        @state_next,
        convert(binary(2), crypt_gen_random(2)),
        convert(bigint, crypt_gen_random(8)) & -4611686018427387905
    ) as a;

    set @ulid_high = convert(binary(8), substring(@ulid, 1, 8));
    set @ulid_low = convert(bigint, substring(@ulid, 9, 8));

    if @state_ms is null
        insert into [changefeed].[state:changefeed.__template_serialized__]
        (shard_id, last_ms, ulid_high, next_counter, updated_at)
        values (
            @shard_id,
            convert(bigint, substring(@ulid, 1, 6)),
            @ulid_high,
            @ulid_low + 100000000000,
            sysutcdatetime()
        );
    else
        update [changefeed].[state:changefeed.__template_serialized__]
        set
            last_ms = convert(bigint, substring(@ulid, 1, 6)),
            ulid_high = @ulid_high,
            next_counter = @ulid_low + 100000000000,
            updated_at = sysutcdatetime()
        where shard_id = @shard_id;

    -- high (8) || first counter (8) || the transaction it belongs to (8): ulid(@i) refuses
    -- to hand out numbers of a range reserved by another (earlier) transaction.
    set @range = @ulid_high + convert(binary(8), @ulid_low)
        + convert(binary(8), current_transaction_id());
    exec sys.sp_set_session_context @key = @context_key, @value = @range;
end
