-- The i-th ULID (1-based) of the range lock_feed reserved in the current transaction, for a
-- serialized-writer feed; written as the template feed's function. Writers number
-- multi-row inserts with it: ulid(row_number() over (order by ...)).
-- A scalar function cannot THROW: a call with no lock_feed in this transaction, or with @i
-- outside 1..10^11, fails on a deliberate conversion error whose text says what to do.
create or alter function [changefeed].[ulid:changefeed.__template_serialized__] (@i bigint)
returns binary(16)
as
begin
    declare @range varbinary(24) = convert(
        varbinary(24),
        -- The key lock_feed wrote; a literal, as there.
        session_context(N'changefeed.ulid:changefeed.__template_serialized__')
    );
    declare @problem nvarchar(200) = case
        when
            @range is null
            or datalength(@range) <> 24
            or convert(bigint, substring(@range, 17, 8)) <> current_transaction_id()
            then N'changefeed: ulid(@i) needs lock_feed of this feed earlier in the same transaction; call lock_feed first.'
        when @i is null or @i < 1 or @i > 100000000000
            then N'changefeed: ulid(@i) takes @i from 1 to 100000000000, the range lock_feed reserved.'
    end;

    -- The failure is part of the returned expression, not a separate assignment, so that
    -- scalar-function inlining (SQL Server 2019+) cannot optimize it away.
    return case
        when @problem is null
            then convert(
                binary(16),
                convert(binary(8), substring(@range, 1, 8))
                + convert(binary(8), convert(bigint, substring(@range, 9, 8)) + @i - 1)
            )
        else convert(binary(16), convert(int, @problem))
    end;
end
