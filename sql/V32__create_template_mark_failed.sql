-- mark_failed for a claim-style outbox, written as the template outbox's procedure.
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

    update [changefeed].[__template_outbox__]
    set
        status = case when @dead = 1 then 4 else 3 end,
        attempts = attempts + 1,
        next_retry_at = case when @dead = 1 then null else @retry_at end,
        processed_at = case when @dead = 1 then sysutcdatetime() end,
        last_error = @error
    where id = @id and status = 1 and claim_token = @claim_token;

    select @@rowcount as updated;
end
