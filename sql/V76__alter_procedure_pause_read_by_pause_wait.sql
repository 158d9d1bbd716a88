-- One pause of a long-polling read_feed (both modes), now one case of pause_wait, which the
-- outbox claim's wait shares: the schedule of before, 5 ms doubling to 100 ms (only a pause
-- cut short at the deadline, the last of a wait, now restarts from 1 ms, not 5), so a
-- fresh event is seen quickly and an idle feed costs at most ten cheap probes a second per
-- waiting reader. The caller has no transaction open (read_feed refuses one, 51100).
create or alter procedure [changefeed].[pause_read]
    @deadline datetime2(3),
    @pause_ms int output
as
begin
    set nocount, xact_abort on;

    exec changefeed.pause_wait
        @deadline = @deadline,
        @max_pause_ms = 100,
        @pause_ms = @pause_ms output;
end
