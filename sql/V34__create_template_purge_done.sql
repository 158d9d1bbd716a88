-- purge_done for a claim-style outbox, written as the template outbox's procedure.
-- Deletes done messages processed more than @older_than_ms ago (cutoff on the server's
-- clock), @batch_size rows per statement so no statement holds many locks or escalates,
-- and at most @max_rows in all (null: no limit). Dead messages are never purged. Returns
-- one row, deleted = how many rows went. Call it outside a transaction, or every batch's
-- locks are held until your commit.
create or alter procedure [changefeed].[purge_done:changefeed.__template_outbox__]
    @older_than_ms bigint,
    @batch_size int = 1000,
    @max_rows bigint = null
as
begin
    set nocount, xact_abort on;
    -- Each batch must commit on its own: under a caller's SET IMPLICIT_TRANSACTIONS ON the
    -- first delete would open a transaction that holds every batch's locks until the client
    -- commits. Reverts on return.
    set implicit_transactions off;

    -- 100 years. Typed: a bare literal above the int range would be numeric.
    declare @max_older_than_ms bigint = 3155760000000;

    if @older_than_ms is null or @older_than_ms < 0 or @older_than_ms > @max_older_than_ms
        throw 51308, N'purge_done: @older_than_ms must be between 0 and 3155760000000 (100 years), e.g. 7776000000 for 90 days.', 1;
    if @batch_size is null or @batch_size < 1 or @batch_size > 4000
        throw 51308, N'purge_done: @batch_size must be between 1 and 4000 (below lock escalation).', 1;
    if @max_rows < 1
        throw 51308, N'purge_done: @max_rows must be positive, or null for no limit.', 1;

    -- On the server's clock, never the client's.
    declare @cutoff datetime2(3) = (
        select at_time from changefeed.time_after(sysutcdatetime(), -@older_than_ms)
    );
    declare @deleted bigint = 0;
    declare @take int;
    declare @count int;

    while 1 = 1
    begin
        set @take = case
            when @max_rows is not null and @max_rows - @deleted < @batch_size
                then convert(int, @max_rows - @deleted)
            else @batch_size
        end;
        if @take <= 0 break;

        delete top (@take) from [changefeed].[__template_outbox__]
        where status = 2 and processed_at < @cutoff;

        set @count = @@rowcount;
        set @deleted = @deleted + @count;
        if @count < @take break;
    end;

    select @deleted as deleted;
end
