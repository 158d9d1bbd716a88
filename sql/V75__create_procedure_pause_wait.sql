-- One pause of a procedure that waits for work (read_feed's long-poll through pause_read, an
-- outbox claim with @wait_ms): waits @pause_ms, never past @deadline, then grows @pause_ms
-- for the next pause by doubling it, up to @max_pause_ms. A waiter starts short, so work
-- that comes soon after its last answer is seen at once, and settles at @max_pause_ms, which
-- bounds both how late work is seen and how often an idle waiter probes.
-- Callers pause only between their own transactions, with none of the caller's open (both
-- refuse to start a wait inside one): a waitfor inside a transaction would keep every lock
-- the transaction took until the pause ends. The lint's R22 checks the callers' text.
-- Internal: called through ownership chaining, so callers need no permission on it.
create or alter procedure [changefeed].[pause_wait]
    @deadline datetime2(3),
    @max_pause_ms int,
    @pause_ms int output
as
begin
    set nocount, xact_abort on;

    declare @pause datetime;
    -- Callers' deadlines are at most an hour away (their @wait_ms is checked), so the
    -- remaining milliseconds fit an int.
    declare @remaining_ms int = convert(int, datediff_big(millisecond, sysutcdatetime(), @deadline));

    if @pause_ms > @remaining_ms set @pause_ms = @remaining_ms;
    if @pause_ms > 0
    begin
        -- waitfor delay takes a time of day as datetime, which rounds milliseconds to
        -- .000/.003/.007: a 1 ms pause is none at all, so callers start at 2 ms or more.
        set @pause = dateadd(millisecond, @pause_ms, convert(datetime, 0));
        waitfor delay @pause;
    end;

    set @pause_ms = case
        -- @pause_ms is at most the remaining wait (under an hour) here: doubling fits an int.
        when @pause_ms * 2 > @max_pause_ms then @max_pause_ms
        when @pause_ms < 1 then 1
        else @pause_ms * 2
    end;
end
