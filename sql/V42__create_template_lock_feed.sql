-- lock_feed for serialized-writer feeds, written as the template feed's procedure.
-- A writer calls it inside its transaction, before inserting its events:
--   1. takes an exclusive, transaction-owned applock for (feed, shard), waiting at most
--      @lock_timeout_ms (-1: as long as it takes). Every writer of the shard queues here
--      until the holder commits or rolls back, so commit order is ULID order;
--   2. reserves 10^11 ULIDs from the shard's state row (changefeed.ulid_at, the allocator
--      of outbox mode), updating the row (locked until commit as well) and recording in it
--      this transaction and the range's first ULID;
--   3. returns the first ULID (@ulid, and its parts @ulid_high, @ulid_low) and records the
--      range, the transaction and the shard in the session context for
--      [changefeed].[ulid:S.T](@i) to hand out.
-- The applock rather than waiting on the state row's lock: its timeout is a parameter, and
-- a timeout or deadlock comes back as a result code we turn into error 51202.
-- A session holding the lock blocks every writer of the shard until it ends: see POWEROFF.md.
--
-- One shard of a feed per transaction: ulid(@i) has no shard parameter, so it can serve only
-- one range, and the session context holds one per feed. A second lock_feed for the same
-- shard is fine (ulid(@i) then hands out the new range); one for another shard of the feed
-- is refused with 51203 instead of silently replacing the first shard's range (whose rows
-- would then get the other shard's ULIDs). Write each shard in a transaction of its own.
--
-- Savepoints: rolling back to a savepoint taken before lock_feed undoes the state row's
-- update but not the session context (it is not transactional). ulid(@i) therefore checks
-- that the shard's state row still records this transaction and this range, and fails if
-- not; call lock_feed again after such a rollback. A range a client computes itself from
-- @ulid_high/@ulid_low (the Rust writer::lock_feed) is the client's to discard likewise.
--
-- Time hints: @time_hint (default: the server's clock) later than the server's clock plus
-- 1000 ms counts as that instant, so one wrong hint cannot move the shard's clock ahead for
-- good (as in read_feed; src/allocator.rs HINT_TOLERANCE_MS); before 1970 it counts as 1970;
-- earlier than the shard's last millisecond, the range continues that millisecond.
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

    -- No implicit_transactions setting here: lock_feed opens no transaction of its own, it
    -- needs the caller's. An EXEC does not open an implicit transaction, so a client with
    -- IMPLICIT_TRANSACTIONS ON that calls lock_feed first still has none.
    if @@trancount = 0
        throw 51200, N'lock_feed must be called inside the writer''s transaction: the shard stays locked until that transaction ends, which is what keeps commit order equal to ULID order. Begin a transaction first (begin transaction). With SET IMPLICIT_TRANSACTIONS ON an EXEC does not open one: run begin transaction, or a statement that opens one, before lock_feed.', 1;
    if @shard_id is null
        throw 51201, N'lock_feed: @shard_id is null. Pass the shard (0 for an unsharded feed).', 1;
    if @lock_timeout_ms is null or @lock_timeout_ms < -1
        throw 51201, N'lock_feed: @lock_timeout_ms must be -1 (wait as long as it takes) or a number of milliseconds >= 0.', 1;

    -- Literals the generator fills with the feed's name; not object_id(), which inside a
    -- procedure answers with the caller's metadata visibility (NULL for a writer login).
    declare @lock_resource nvarchar(255) = concat(
        N'changefeed:lock_feed:changefeed.__template_serialized__:', @shard_id
    );
    -- A session-context key is at most 128 bytes (64 nvarchar characters), too short for
    -- 'changefeed.ulid:' and a name of up to 109 characters: the key carries the first 16
    -- bytes of the name's SHA-256 instead, in hex (16 + 32 characters). ulid(@i) builds the
    -- same key from the same literal.
    declare @context_key sysname = N'changefeed.ulid:' + convert(
        nvarchar(32),
        convert(binary(16), hashbytes('SHA2_256', N'changefeed.__template_serialized__')),
        2
    );
    declare @epoch datetime2(3) = convert(datetime2(3), '19700101', 112);
    declare @now datetime2(3) = sysutcdatetime();
    declare @hint datetime2(3) = isnull(@time_hint, @now);
    -- How far a time hint may be ahead of the server's clock (see the header).
    declare @hint_tolerance_ms bigint = 1000;
    declare @latest_ms bigint = datediff_big(millisecond, @epoch, @now) + @hint_tolerance_ms;
    declare @hint_ms bigint = case
        when @hint < @epoch then 0
        else datediff_big(millisecond, @epoch, @hint)
    end;
    -- Bit 62 cleared: adding up to 2^62 to a fresh counter can then never overflow or change
    -- its sign. A typed variable: the literal -4611686018427387905 would be numeric, which
    -- '&' refuses (Msg 402); the hex literal converts to bigint as big-endian two's complement.
    declare @counter_mask bigint = convert(bigint, 0xBFFFFFFFFFFFFFFF);
    -- ULIDs reserved per call (ulid(@i) takes @i up to this); typed, as the mask.
    declare @reservation bigint = 100000000000;
    declare @transaction_id bigint = current_transaction_id();
    declare @previous varbinary(28) = convert(varbinary(28), session_context(@context_key));
    declare @lock_result int;
    declare @message nvarchar(2048);
    declare @state_ms bigint;
    declare @state_high binary(8);
    declare @state_next bigint;
    declare @range binary(28);

    if @hint_ms > @latest_ms set @hint_ms = @latest_ms;

    -- The range of an earlier lock_feed of this feed in this transaction (see the header).
    if datalength(@previous) = 28
        and convert(bigint, substring(@previous, 17, 8)) = @transaction_id
        and convert(int, substring(@previous, 25, 4)) <> @shard_id
    begin
        set @message = concat(
            N'lock_feed: this transaction already locked shard ',
            convert(int, substring(@previous, 25, 4)), N' of this feed, and ulid(@i) serves',
            N' one shard per transaction; locking shard ', @shard_id, N' too would hand that',
            N' shard''s ULIDs to the first shard''s rows. Your transaction was rolled back;',
            N' write each shard of a feed in a transaction of its own.'
        );
        throw 51203, @message, 1;
    end;

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

    -- UPDLOCK, HOLDLOCK: the applock already serializes this shard's writers; the hints make
    -- the first-use insert of a missing state row race-free on their own as well.
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
        @hint_ms,
        1,
        1,
        @state_ms,
        @state_high,
        @state_next,
        convert(binary(2), crypt_gen_random(2)),
        convert(bigint, crypt_gen_random(8)) & @counter_mask
    ) as a;

    set @ulid_high = convert(binary(8), substring(@ulid, 1, 8));
    set @ulid_low = convert(bigint, substring(@ulid, 9, 8));

    if @state_ms is null
        insert into [changefeed].[state:changefeed.__template_serialized__]
        (
            shard_id, last_ms, ulid_high, next_counter, updated_at,
            reserved_by_transaction, reserved_first_ulid
        )
        values (
            @shard_id,
            convert(bigint, substring(@ulid, 1, 6)),
            @ulid_high,
            @ulid_low + @reservation,
            sysutcdatetime(),
            @transaction_id,
            @ulid
        );
    else
        update [changefeed].[state:changefeed.__template_serialized__]
        set
            last_ms = convert(bigint, substring(@ulid, 1, 6)),
            ulid_high = @ulid_high,
            next_counter = @ulid_low + @reservation,
            updated_at = sysutcdatetime(),
            reserved_by_transaction = @transaction_id,
            reserved_first_ulid = @ulid
        where shard_id = @shard_id;

    -- first ULID (16) || the transaction it belongs to (8) || the shard (4): ulid(@i) refuses
    -- a range of another transaction, and one the shard's state row no longer records.
    set @range = @ulid + convert(binary(8), @transaction_id) + convert(binary(4), @shard_id);
    exec sys.sp_set_session_context @key = @context_key, @value = @range;
end
