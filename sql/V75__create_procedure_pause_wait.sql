-- One pause of a procedure that waits for work (read_feed's long-poll through pause_read, an
-- outbox claim with @wait_ms): waits @pause_ms, cut short at @deadline (datetime rounds the
-- last pause, so it may end up to about 3 ms past it), then grows @pause_ms for the next
-- pause by doubling it, up to @max_pause_ms. A waiter starts short, so work
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
    -- bigint: callers' deadlines are at most an hour away (their @wait_ms is checked), but
    -- a deadline more than 24 days off must not fail the conversion (Msg 8115).
    declare @remaining_ms bigint = datediff_big(millisecond, sysutcdatetime(), @deadline);

    -- A NULL or non-positive pause would make a looping caller spin without pausing.
    if @pause_ms is null or @pause_ms < 1 set @pause_ms = 1;
    if @max_pause_ms is null or @max_pause_ms < 2 set @max_pause_ms = 2;
    -- No pause longer than the cap, so waitfor never gets 24 hours or more (a time of day).
    if @pause_ms > @max_pause_ms set @pause_ms = @max_pause_ms;
    -- Both sides bigint; the value assigned is below @pause_ms, an int.
    if @pause_ms > @remaining_ms
        set @pause_ms = convert(int, case when @remaining_ms < 0 then 0 else @remaining_ms end);
    if @pause_ms > 0
    begin
        -- waitfor delay takes a time of day as datetime, which rounds milliseconds to
        -- .000/.003/.007: a 1 ms pause is none at all, so callers start at 2 ms or more.
        set @pause = dateadd(millisecond, @pause_ms, convert(datetime, 0));
        waitfor delay @pause;
    end;

    set @pause_ms = case
        -- Doubled in bigint, so no @pause_ms a caller passes can overflow it.
        when convert(bigint, @pause_ms) * 2 > @max_pause_ms then @max_pause_ms
        when @pause_ms < 1 then 1
        else @pause_ms * 2
    end;
end
