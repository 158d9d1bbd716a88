-- The UTC time carried by a ULID (its first 6 bytes: ms since 1970-01-01), as datetime2(3),
-- or NULL when that time is past 9999-12-31 23:59:59.999, the last datetime2 value: 6 bytes
-- reach year 10889, and any 16 bytes may be saved as a cursor (Ulid::MAX is an obvious
-- "never" sentinel), so a view that shows cursor times must not fail on one of them.
-- Days first, then the remainder: dateadd takes an int, and ms since 1970 overflow an int.
create or alter function [changefeed].[ulid_time] (@ulid binary(16))
returns datetime2(3)
with schemabinding
as
begin
    declare @ms bigint = convert(bigint, substring(@ulid, 1, 6));
    -- 2932897 days from 1970-01-01 to 10000-01-01, in ms, minus one. A typed variable: the
    -- bare literal is numeric (it is above the int range).
    declare @last_ms bigint = 253402300799999;

    if @ms > @last_ms return null;
    return dateadd(
        millisecond,
        convert(int, @ms % 86400000),
        dateadd(day, convert(int, @ms / 86400000), convert(datetime2(3), '19700101', 112))
    );
end
