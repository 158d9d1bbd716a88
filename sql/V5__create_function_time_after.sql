-- The time @ms milliseconds after @from (before it for a negative @ms), for delays and
-- retention windows given in milliseconds. dateadd takes an int, which holds only ~24.8
-- days of milliseconds: whole days are added first, then the remainder (both fit an int for
-- any window up to ~5.8 million years). An inline table-valued function, so callers pay no
-- per-call function overhead: select @at = at_time from changefeed.time_after(@from, @ms).
create or alter function [changefeed].[time_after] (@from datetime2(3), @ms bigint)
returns table
as
return
select
    dateadd(
        millisecond,
        convert(int, @ms % 86400000),
        dateadd(day, convert(int, @ms / 86400000), @from)
    ) as at_time;
