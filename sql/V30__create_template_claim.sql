-- claim for a claim-style outbox, written as the template outbox's procedure.
-- One atomic statement claims up to @batch_size due messages under a fresh claim token and
-- returns them ordered by id. Due: pending; failed whose retry time has come; processing
-- whose claim is older than @claim_timeout_ms (the reaper: that counts an attempt).
-- Head of aggregate only: a message is skipped while an earlier message of its aggregate is
-- pending, processing or failed, so at most one message per aggregate is in flight and an
-- aggregate's messages are published in order.
--
-- Locking hints, each for a reason:
--   READCOMMITTEDLOCK  locking reads even under READ_COMMITTED_SNAPSHOT; without it the
--                      scan would read row versions and two claimers could take one row.
--   READPAST           skip rows another claimer or a writer holds instead of waiting.
--   UPDLOCK, ROWLOCK   hold what we read until the update, row by row, so concurrent
--                      claimers never take the same row and never lock more than it.
--   The head probe has READCOMMITTEDLOCK but deliberately no READPAST: skipping a locked
--   earlier row of the aggregate (an uncommitted enqueue, another claimer's update) would
--   let a later row overtake it; the probe waits for it instead.
--   MAXDOP 1           parallel plans with READPAST/UPDLOCK are known to deadlock.
create or alter procedure [changefeed].[claim:changefeed.__template_outbox__]
    @batch_size int = 100,
    @claim_timeout_ms int = 30000
as
begin
    set nocount, xact_abort on;
    -- READPAST needs a locking isolation level; this reverts on return.
    set transaction isolation level read committed;

    if @batch_size is null or @batch_size < 1 or @batch_size > 10000
        throw 51301, N'claim: @batch_size must be between 1 and 10000.', 1;
    if @claim_timeout_ms is null or @claim_timeout_ms < 1 or @claim_timeout_ms > 86400000
        throw 51301, N'claim: @claim_timeout_ms must be between 1 and 86400000 (24 hours).', 1;

    declare @token uniqueidentifier = newid();
    declare @now datetime2(3) = sysutcdatetime();
    declare @expired_before datetime2(3) = dateadd(millisecond, -@claim_timeout_ms, @now);
    declare @claimed table (
        id bigint not null primary key,
        message_id nvarchar(64) not null,
        topic nvarchar(256) not null,
        aggregate_type nvarchar(128) null,
        aggregate_id nvarchar(256) null,
        partition_key nvarchar(256) null,
        payload nvarchar(max) not null,
        headers nvarchar(max) null,
        trace_id nvarchar(128) null,
        attempts int not null
    );

    with due as (
        select top (@batch_size)
            t.id,
            t.message_id,
            t.topic,
            t.aggregate_type,
            t.aggregate_id,
            t.partition_key,
            t.payload,
            t.headers,
            t.trace_id,
            t.status,
            t.attempts,
            t.claimed_at,
            t.claim_token
        from [changefeed].[__template_outbox__] as t
            with (readcommittedlock, readpast, updlock, rowlock)
        where
            (
                t.status = 0
                or (t.status = 3 and t.next_retry_at <= @now)
                or (t.status = 1 and t.claimed_at < @expired_before)
            )
            and not exists (
                select 1
                from [changefeed].[__template_outbox__] as earlier with (readcommittedlock)
                where
                    earlier.aggregate_id = t.aggregate_id
                    and earlier.id < t.id
                    and earlier.status in (0, 1, 3)
            )
        order by t.id
    )

    update due
    set
        attempts = attempts + case when status = 1 then 1 else 0 end,
        status = 1,
        claimed_at = @now,
        claim_token = @token
    output
        inserted.id,
        inserted.message_id,
        inserted.topic,
        inserted.aggregate_type,
        inserted.aggregate_id,
        coalesce(inserted.partition_key, inserted.aggregate_id),
        convert(nvarchar(max), inserted.payload),
        convert(nvarchar(max), inserted.headers),
        inserted.trace_id,
        inserted.attempts
    into @claimed (
        id, message_id, topic, aggregate_type, aggregate_id, partition_key,
        payload, headers, trace_id, attempts
    )
    option (maxdop 1);

    select
        id,
        message_id,
        topic,
        aggregate_type,
        aggregate_id,
        partition_key,
        payload,
        headers,
        trace_id,
        attempts,
        @token as claim_token
    from @claimed
    order by id;
end
