-- requeue for a claim-style outbox, written as the template outbox's procedure.
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

    update [changefeed].[__template_outbox__]
    set
        status = 3,
        next_retry_at = @retry_at,
        processed_at = null
    where
        id = @id
        and (
            (@claim_token is not null and status = 1 and claim_token = @claim_token)
            or (@claim_token is null and status in (3, 4))
        );

    select @@rowcount as updated;
end
