-- requeue for a claim-style outbox, written as the template outbox's procedure (replaces
-- V33's). What changed: the update is pinned to a seek of the clustered index by @id
-- (FORCESEEK, INDEX(1)), so it reads no other row and can never wait for an open
-- transaction on another row (the argument is beside the update).
-- Puts a message back as failed, due after @retry_after_ms (server clock), attempts
-- unchanged: for backpressure, when the broker asked us to slow down and the message
-- itself is fine. With @claim_token it is fenced like mark_done (a relay hands back what it
-- holds); without one it redrives a dead or failed message (an operator's decision after
-- fixing the cause). Returns one row, updated = 0 or 1.
create or alter procedure [changefeed].[requeue:changefeed.__template_outbox__]
    @id bigint,
    @claim_token uniqueidentifier = null,
    @retry_after_ms bigint = 0
as
begin
    set nocount, xact_abort on;
    -- One statement, which commits on its own when the caller has no transaction. Under a
    -- caller's SET IMPLICIT_TRANSACTIONS ON it would open one and return with it open,
    -- holding the row locked: claim would hold back their aggregates until the client
    -- commits. Reverts on return. Inside a caller's transaction it joins that transaction.
    set implicit_transactions off;

    -- 366 days. Typed: a bare literal above the int range would be numeric.
    declare @max_retry_after_ms bigint = 31622400000;

    if @id is null
        throw 51302, N'requeue: @id is required.', 1;
    if @retry_after_ms is null or @retry_after_ms < 0 or @retry_after_ms > @max_retry_after_ms
        throw 51303, N'requeue: @retry_after_ms must be between 0 and 31622400000 (366 days).', 1;

    -- On the server's clock, never the client's.
    declare @retry_at datetime2(3) = (
        select at_time from changefeed.time_after(sysutcdatetime(), @retry_after_ms)
    );

    -- This update must never wait on a row it does not hand back, and it reads no other:
    -- the row @id, sought on the clustered index. Its reads take update locks, so a scan,
    -- or a seek of another index on status (done_by_processed_at), would read rows of other
    -- aggregates (an open transaction's uncommitted enqueue, another transaction's claim not
    -- yet committed) and wait for that transaction: a relay's backpressure would wait behind
    -- it, claims would expire, and messages would be published again. An equality on the
    -- unique clustered key is a seek in every plan the optimizer produces today; the hint
    -- makes that a guarantee rather than a costing outcome, and the lint (R23) can see it.
    -- The row @id itself is held by another transaction only when that one claims or
    -- acknowledges the same row, and then waiting is right: its outcome decides whether
    -- this fenced update applies.
    -- FORCESEEK (allowed on a FROM-clause table of an UPDATE; only its form naming index
    -- columns is refused for the target) with INDEX(1), the clustered index by its id, not
    -- its name (a table made by hand names its primary key its own way): the only plan left
    -- is a seek of the clustered index, whose key is exactly (id) (upgrade_outbox checks it
    -- before generating this code, and upgrade_all_feeds skips and reports an outbox
    -- without it). Were no such seek possible, the call would fail at once (Msg 8622)
    -- instead of waiting.
    update t
    set
        status = 3,
        next_retry_at = @retry_at,
        processed_at = null
    from [changefeed].[__template_outbox__] as t with (forceseek, index(1))
    where
        t.id = @id
        and (
            (@claim_token is not null and t.status = 1 and t.claim_token = @claim_token)
            or (@claim_token is null and t.status in (3, 4))
        );

    select @@rowcount as updated;
end
