-- backlog for a claim-style outbox, written as the template outbox's procedure: what the
-- relay's gauges (changefeed_outbox_*) and `changefeed status` show. One row:
--   pending, processing, failed, dead: bigint, the messages of status 0, 1, 3 and 4, each
--       count stopping at @count_limit (a count equal to it means at least that many);
--   oldest_open_age_ms: bigint, milliseconds since the oldest open message (pending,
--       processing or failed: not yet published, not dead) was enqueued, by the server's
--       clock; NULL when no message is open.
-- Cheap on any outbox, so that it can be polled every few seconds:
--   * each count seeks done_by_processed_at (status, processed_at) on one status and reads
--     at most @count_limit of its entries (TOP), nothing of the table: the index holds
--     status and a count needs nothing else. Done rows, however many, are never read.
--   * the oldest open message is the first entry of open_messages (keyed on id, filtered
--     on status in (0, 1, 3); the predicate repeats the filter so the index applies), then
--     one clustered-key lookup for its created_at.
--   * No index hints: those are the plans the optimizer picks for these predicates, and a
--     hint would turn an outbox whose owner dropped an index into an error (Msg 308, which
--     could fail the upgrade that regenerates every outbox), and a session whose SET
--     options rule out filtered indexes into Msg 8622; without one such an outbox is only
--     slower.
--   * READUNCOMMITTED on every read: no shared locks, so it neither waits for a claim, an
--     acknowledgement or an open enqueue nor blocks one. The counts may include rows of a
--     transaction that has not committed yet: a gauge is a moment's approximation anyway
--     (an enqueue rolled back between the two reads can leave a NULL age next to non-zero
--     counts for one poll). It still takes a schema-stability lock, so it waits for DDL on
--     the table (an offline index rebuild, a rename), never for row locks. "At most
--     @count_limit entries" counts live entries: ghosts of recent acknowledgements that
--     cleanup has not removed yet are passed over as well.
create or alter procedure [changefeed].[backlog:changefeed.__template_outbox__]
    @count_limit bigint = 100000
as
begin
    set nocount, xact_abort on;
    -- No transaction may outlive the call under a caller's SET IMPLICIT_TRANSACTIONS ON.
    -- Reverts on return.
    set implicit_transactions off;

    if @count_limit is null or @count_limit < 1
        throw 51319, N'backlog: @count_limit must be a positive number of messages (the default is 100000).', 1;

    declare @oldest_id bigint;
    declare @oldest_at datetime2(3);

    select top (1) @oldest_id = o.id
    from [changefeed].[__template_outbox__] as o with (readuncommitted)
    where o.status in (0, 1, 3)
    order by o.id;

    if @oldest_id is not null
        select @oldest_at = t.created_at
        from [changefeed].[__template_outbox__] as t with (readuncommitted)
        where t.id = @oldest_id;

    select
        (
            select count_big(*)
            from (
                select top (@count_limit) 1 as one
                from [changefeed].[__template_outbox__] as s with (readuncommitted)
                where s.status = 0
            ) as c
        ) as pending,
        (
            select count_big(*)
            from (
                select top (@count_limit) 1 as one
                from [changefeed].[__template_outbox__] as s with (readuncommitted)
                where s.status = 1
            ) as c
        ) as processing,
        (
            select count_big(*)
            from (
                select top (@count_limit) 1 as one
                from [changefeed].[__template_outbox__] as s with (readuncommitted)
                where s.status = 3
            ) as c
        ) as failed,
        (
            select count_big(*)
            from (
                select top (@count_limit) 1 as one
                from [changefeed].[__template_outbox__] as s with (readuncommitted)
                where s.status = 4
            ) as c
        ) as dead,
        datediff_big(millisecond, @oldest_at, sysutcdatetime()) as oldest_open_age_ms;
end
