-- The UTC time carried by a ULID (its first 6 bytes: ms since 1970-01-01), as datetime2(3).
-- Days first, then the remainder: dateadd takes an int, and ms since 1970 overflow an int.
create or alter function [changefeed].[ulid_time] (@ulid binary(16))
returns datetime2(3)
with schemabinding
as
begin
    declare @ms bigint = convert(bigint, substring(@ulid, 1, 6));
    return dateadd(
        millisecond,
        @ms % 86400000,
        dateadd(day, @ms / 86400000, convert(datetime2(3), '19700101', 112))
    );
end
