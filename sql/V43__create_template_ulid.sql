-- The i-th ULID (1-based) of the range lock_feed reserved in the current transaction, for a
-- serialized-writer feed; written as the template feed's function. Writers number
-- multi-row inserts with it: ulid(row_number() over (order by ...)).
--
-- The range comes from the session context, which is not transactional; the shard's state
-- row is. So a range is handed out only while both agree: the context was written in this
-- transaction (its transaction id), and the state row of its shard still records this
-- transaction and this first ULID. A rollback to a savepoint taken before lock_feed undoes
-- the state row but not the context; without this check ulid(@i) would keep handing out a
-- range the shard no longer records, which the next lock_feed issues again (duplicate keys,
-- or rows below what readers have passed). An applock check alone would miss a second
-- lock_feed after the rollback, which holds the lock again.
--
-- Reading the state row here needs no permission of the writer (ownership chaining: one
-- owner), and never waits in a correct call: this transaction's lock_feed holds the row's
-- lock. It is read only after the context's transaction id matched.
--
-- A scalar function cannot THROW: a call with no lock_feed in this transaction, a range
-- undone by a savepoint rollback, or @i outside 1..10^11 fails on a deliberate conversion
-- error whose text says what to do. SQL Server 2019+ may inline the function (a table read,
-- IF and one RETURN are all inlineable); the failure is then part of the inlined expression,
-- so it still fires (see the RETURN).
create or alter function [changefeed].[ulid:changefeed.__template_serialized__] (@i bigint)
returns binary(16)
as
begin
    -- The session-context key lock_feed uses, built the same way (see there: a hash of the
    -- feed's name, as a key is at most 128 bytes).
    declare @context_key sysname = N'changefeed.ulid:' + convert(
        nvarchar(32),
        convert(binary(16), hashbytes('SHA2_256', N'changefeed.__template_serialized__')),
        2
    );
    -- first ULID (16) || transaction id (8) || shard (4), as lock_feed wrote it.
    declare @range varbinary(28) = convert(varbinary(28), session_context(@context_key));
    -- ULIDs reserved per lock_feed call; typed (a literal above the int range is numeric).
    declare @reservation bigint = 100000000000;
    declare @first binary(16);
    declare @shard_id int;
    declare @problem nvarchar(400);

    if datalength(@range) = 28
        and convert(bigint, substring(@range, 17, 8)) = current_transaction_id()
    begin
        set @first = convert(binary(16), substring(@range, 1, 16));
        set @shard_id = convert(int, substring(@range, 25, 4));
        if not exists (
            select 1
            from [changefeed].[state:changefeed.__template_serialized__]
            where
                shard_id = @shard_id
                and reserved_by_transaction = current_transaction_id()
                and reserved_first_ulid = @first
        )
            set @problem = N'changefeed: ulid(@i): the range lock_feed reserved in this transaction was undone by a rollback to a savepoint (the shard''s state no longer records it); call lock_feed again before numbering rows.';
    end
    else
        set @problem = N'changefeed: ulid(@i) needs lock_feed of this feed earlier in the same transaction; call lock_feed first.';

    if @problem is null and (@i is null or @i < 1 or @i > @reservation)
        set @problem = N'changefeed: ulid(@i) takes @i from 1 to 100000000000, the range lock_feed reserved.';

    -- The failure is part of the returned expression, not a separate assignment, so that
    -- scalar-function inlining (SQL Server 2019+) cannot optimize it away.
    return case
        when @problem is null
            then convert(
                binary(16),
                convert(binary(8), substring(@first, 1, 8))
                + convert(binary(8), convert(bigint, substring(@first, 9, 8)) + @i - 1)
            )
        else convert(binary(16), convert(int, @problem))
    end;
end
