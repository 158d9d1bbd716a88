-- One pause of a long-polling read_feed (both modes): waits @pause_ms, never past
-- @deadline, holding no lock (the caller has no transaction open), then grows @pause_ms
-- for the next pause: 5 ms doubling to 100 ms, so a fresh event is seen quickly and an idle
-- feed costs at most ten cheap probes a second per waiting reader.
create or alter procedure [changefeed].[pause_read]
    @deadline datetime2(3),
    @pause_ms int output
as
begin
    set nocount, xact_abort on;

    declare @pause datetime;
    -- The deadline is at most an hour away, so the remaining milliseconds fit an int.
    declare @remaining_ms int = convert(int, datediff_big(millisecond, sysutcdatetime(), @deadline));

    if @pause_ms > @remaining_ms set @pause_ms = @remaining_ms;
    if @pause_ms > 0
    begin
        set @pause = dateadd(millisecond, @pause_ms, convert(datetime, 0));
        waitfor delay @pause;
    end;

    set @pause_ms = case
        when @pause_ms * 2 > 100 then 100
        when @pause_ms < 5 then 5
        else @pause_ms * 2
    end;
end
