-- held_aggregates for a claim-style outbox, written as the template outbox's procedure.
-- What claim cannot see past: aggregates whose committed open messages wait because an
-- earlier row of the aggregate is held by an open transaction (an uncommitted enqueue, a
-- claim or an acknowledgement not yet committed; see claim). The wait lasts until that
-- transaction ends, so a business transaction left open (a slow client, a client that lost
-- power: POWEROFF.md) holds back its aggregate, and only it, until SQL Server ends it.
--
-- Two result sets:
--   1. one row per held aggregate: aggregate_id; held_id and held_status, the first held
--      row and its status as last written (0 for an uncommitted enqueue); waiting, the
--      committed open messages behind it; first_waiting_id; oldest_waiting_at.
--   2. the sessions other than this one that hold exclusive row locks on this outbox table
--      (the candidates for the holder): session_id, locked_rows, status,
--      open_transaction_count, last_request_end_time, host_name, program_name, login_name.
--      A sleeping session with an open transaction and an old last_request_end_time is a
--      stuck or dead client; KILL <session_id> rolls it back and frees its aggregates.
--      SQL Server does not say which row lock belongs to which row without undocumented
--      functions, so the sessions are listed per table, not per aggregate. Reading lock
--      information needs VIEW SERVER STATE (VIEW DATABASE STATE on Azure SQL Database);
--      without it the second result set is empty.
-- Read-only and lock-free for writers: the dirty read takes no row locks, the committed
-- reads skip held rows (READPAST). It reads the whole table: an operator's tool, not
-- something to poll.
create or alter procedure [changefeed].[held_aggregates:changefeed.__template_outbox__]
as
begin
    set nocount, xact_abort on;
    -- Its reads must not open a transaction that outlives the call under a caller's SET
    -- IMPLICIT_TRANSACTIONS ON. Reverts on return.
    set implicit_transactions off;
    -- READPAST needs a locking isolation level; this reverts on return.
    set transaction isolation level read committed;

    declare @can_see_locks bit = case
        when convert(int, serverproperty('EngineEdition')) = 5
            then convert(bit, has_perms_by_name(db_name(), N'DATABASE', N'VIEW DATABASE STATE'))
        else convert(bit, has_perms_by_name(null, null, N'VIEW SERVER STATE'))
    end;

    -- Hints: READCOMMITTEDLOCK, READPAST read committed rows and skip held ones without
    -- waiting (also under READ_COMMITTED_SNAPSHOT); READUNCOMMITTED sees held rows as last
    -- written; INDEX(head_of_aggregate) reads both on the index claim reads, so "held"
    -- means here what it means to claim.
    with waiting as (
        select
            w.aggregate_id,
            min(w.id) as first_waiting_id,
            count_big(*) as waiting,
            min(w.created_at) as oldest_waiting_at
        from [changefeed].[__template_outbox__] as w with (readcommittedlock, readpast)
        where w.status in (0, 1, 3) and w.aggregate_id is not null
        group by w.aggregate_id
    )

    select
        w.aggregate_id,
        h.held_id,
        h.held_status,
        w.waiting,
        w.first_waiting_id,
        w.oldest_waiting_at
    from waiting as w
    cross apply (
        select top (1)
            dirty.id as held_id,
            dirty.status as held_status
        from [changefeed].[__template_outbox__] as dirty
            with (readuncommitted, index(head_of_aggregate))
        where
            dirty.aggregate_id = w.aggregate_id
            and dirty.id < w.first_waiting_id
            and not exists (
                select 1
                from [changefeed].[__template_outbox__] as committed
                    with (readcommittedlock, readpast, index(head_of_aggregate))
                where committed.aggregate_id = dirty.aggregate_id and committed.id = dirty.id
            )
        order by dirty.id
    ) as h
    order by w.oldest_waiting_at, w.aggregate_id;

    -- A branch, not a predicate: without the permission, reading the DMVs fails however
    -- the query is filtered.
    if @can_see_locks = 1
        select
            l.request_session_id as session_id,
            count_big(*) as locked_rows,
            s.status,
            s.open_transaction_count,
            s.last_request_end_time,
            s.host_name,
            s.program_name,
            s.login_name
        from sys.dm_tran_locks as l
        inner join sys.partitions as p on l.resource_associated_entity_id = p.hobt_id
        inner join sys.dm_exec_sessions as s on l.request_session_id = s.session_id
        where
            l.resource_database_id = db_id()
            and l.resource_type = N'KEY'
            and l.request_mode = N'X'
            and p.object_id = object_id(N'[changefeed].[__template_outbox__]')
            and l.request_session_id <> @@spid
        group by
            l.request_session_id,
            s.status,
            s.open_transaction_count,
            s.last_request_end_time,
            s.host_name,
            s.program_name,
            s.login_name
        order by s.last_request_end_time, l.request_session_id;
    else
        -- The same columns, no rows.
        select top (0)
            convert(int, null) as session_id,
            convert(bigint, null) as locked_rows,
            convert(nvarchar(30), null) as status,
            convert(int, null) as open_transaction_count,
            convert(datetime, null) as last_request_end_time,
            convert(nvarchar(128), null) as host_name,
            convert(nvarchar(128), null) as program_name,
            convert(nvarchar(128), null) as login_name;
end
