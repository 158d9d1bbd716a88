-- mark_failed for a claim-style outbox, written as the template outbox's procedure
-- (replaces V32's). What changed: the update is pinned to a seek of the clustered index by
-- @id (INDEX(1)), so it reads no other row and can never wait for an open
-- transaction on another row (the argument is beside the update).
-- Fenced like mark_done. Counts an attempt. With @dead = 1 the message becomes dead
-- (terminal: never claimed, never purged); otherwise it is failed and due again after
-- @retry_after_ms, computed on the server's clock. Failed without a retry time is refused:
-- it would be due at once and hot-loop. Returns one row, updated = 0 or 1.
create or alter procedure [changefeed].[mark_failed:changefeed.__template_outbox__]
    @id bigint,
    @claim_token uniqueidentifier,
    @retry_after_ms bigint = null,
    @dead bit = 0,
    @error nvarchar(2000) = null
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

    if @id is null or @claim_token is null
        throw 51302, N'mark_failed: @id and @claim_token are required (the claim_token that claim returned).', 1;
    if isnull(@dead, 0) = 0 and @retry_after_ms is null
        throw 51303, N'mark_failed: a failed message needs @retry_after_ms (when to try again), or @dead = 1 to give up on it.', 1;
    if @retry_after_ms < 0 or @retry_after_ms > @max_retry_after_ms
        throw 51303, N'mark_failed: @retry_after_ms must be between 0 and 31622400000 (366 days).', 1;

    -- On the server's clock, never the client's.
    declare @retry_at datetime2(3) = (
        select at_time from changefeed.time_after(sysutcdatetime(), @retry_after_ms)
    );

    -- This update must never wait on a row it does not acknowledge, and it reads no other:
    -- the row @id, sought on the clustered index. Its reads take update locks, so a scan,
    -- or a seek of another index on status (done_by_processed_at), would read rows of
    -- other aggregates (an open transaction's uncommitted enqueue, another transaction's
    -- claim not yet committed) and wait for that transaction: every acknowledgement would
    -- wait behind it, claims would expire, and messages would be published again.
    -- INDEX(1) reads the outbox through the clustered index (named by its id, not its
    -- name: a table made by hand names its primary key its own way), whose key is exactly
    -- (id): the equality on that whole key makes the read a single-row seek, and no other
    -- index can be chosen instead. upgrade_outbox checks that key before generating this
    -- code, and upgrade_all_feeds skips and reports an outbox without it. The row @id
    -- itself is held by another transaction only when that one claims or acknowledges the
    -- same row, and then waiting is right: its outcome decides whether this fenced update
    -- applies.
    -- No FORCESEEK: SQL Server refused it on the target of read_feed's delete of moved rows
    -- (Msg 10725, "not allowed for target tables of INSERT, UPDATE, or DELETE statements"),
    -- and its documentation does not settle whether the form without index columns is
    -- refused there too.
    update t
    set
        status = case when @dead = 1 then 4 else 3 end,
        attempts = t.attempts + 1,
        next_retry_at = case when @dead = 1 then null else @retry_at end,
        processed_at = case when @dead = 1 then sysutcdatetime() end,
        last_error = @error
    from [changefeed].[__template_outbox__] as t with (index(1))
    where t.id = @id and t.status = 1 and t.claim_token = @claim_token;

    select @@rowcount as updated;
end
