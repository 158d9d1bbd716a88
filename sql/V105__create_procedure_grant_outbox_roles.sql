-- Creates a claim outbox's two database roles when missing and grants them exactly what
-- their callers call (GRANT is idempotent, so upgrade_outbox runs this after every
-- generation, and an outbox set up before these roles existed gets them with its upgrade):
--   [changefeed.relay:S.T]    EXECUTE on claim, mark_done, mark_failed, requeue and backlog
--                             of this outbox: what Relay over SqlClaimStore calls (the
--                             acknowledgements, the hand-back of a message, and backlog for
--                             the metrics gauges of `changefeed relay --metrics-addr`);
--   [changefeed.enqueue:S.T]  EXECUTE on enqueue of this outbox: what OutboxStore::enqueue
--                             calls inside the writer's transaction.
-- Nothing else, and no right on any table: the procedures reach the outbox table through
-- ownership chaining, which setup_outbox and outbox_problem make sure of (the table has the
-- changefeed schema's owner). purge_done and held_aggregates are granted to no one: deleting
-- history and diagnosing locks are an operator's (db_owner, or a user a db_owner grants
-- EXECUTE on them), like purge_feed. requeue with no token redrives a dead message, which
-- a relay's login may therefore do for its own outbox; it is the call a relay hands a
-- message back with, and a second procedure for the redrive would not change who may.
-- The names differ from a feed's roles ([changefeed.writers:S.T], [changefeed.readers:S.T]):
-- teardown_feed drops those by name, and must never drop an outbox's.
-- An outbox whose name makes a role name longer than 128 UTF-16 units gets no roles (only
-- possible for one registered before V71 under a supplementary-character collation, whose
-- name may take up to 111 units; check_table_name keeps newer ones to 108): its procedures
-- are granted by hand, as before these roles. Refusing it here would fail its upgrade.
create or alter procedure [changefeed].[grant_outbox_roles]
    @schema_name sysname,
    @table_name sysname
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @relay_name nvarchar(300) = N'changefeed.relay:' + @schema_name + N'.' + @table_name;
    declare @enqueue_name nvarchar(300)
        = N'changefeed.enqueue:' + @schema_name + N'.' + @table_name;
    declare @relay nvarchar(300);
    declare @enqueuers nvarchar(300);
    declare @enqueue nvarchar(300);
    declare @claim nvarchar(300);
    declare @mark_done nvarchar(300);
    declare @mark_failed nvarchar(300);
    declare @requeue nvarchar(300);
    declare @backlog nvarchar(300);
    declare @sql nvarchar(max);

    -- The longer of the two names (see the top).
    if datalength(@enqueue_name) / 2 > 128
        return;

    set @relay = quotename(@relay_name);
    set @enqueuers = quotename(@enqueue_name);
    select
        @enqueue = max(case when kind = N'enqueue' then quoted_name end),
        @claim = max(case when kind = N'claim' then quoted_name end),
        @mark_done = max(case when kind = N'mark_done' then quoted_name end),
        @mark_failed = max(case when kind = N'mark_failed' then quoted_name end),
        @requeue = max(case when kind = N'requeue' then quoted_name end),
        @backlog = max(case when kind = N'backlog' then quoted_name end)
    from changefeed.outbox_objects(@schema_name, @table_name);

    -- A NULL name would make the statements below NULL, which sp_executesql runs as nothing.
    if @relay is null or @enqueuers is null or @enqueue is null or @claim is null
        or @mark_done is null or @mark_failed is null or @requeue is null or @backlog is null
        throw 51009, N'grant_outbox_roles: a per-outbox name could not be built.', 1;

    begin try
        begin transaction;

        if database_principal_id(@relay_name) is null
        begin
            set @sql = N'create role ' + @relay + N';';
            exec sys.sp_executesql @sql;
        end;
        if database_principal_id(@enqueue_name) is null
        begin
            set @sql = N'create role ' + @enqueuers + N';';
            exec sys.sp_executesql @sql;
        end;

        set @sql = N'grant execute on object::' + @claim + N' to ' + @relay + N'; '
            + N'grant execute on object::' + @mark_done + N' to ' + @relay + N'; '
            + N'grant execute on object::' + @mark_failed + N' to ' + @relay + N'; '
            + N'grant execute on object::' + @requeue + N' to ' + @relay + N'; '
            + N'grant execute on object::' + @backlog + N' to ' + @relay + N'; '
            + N'grant execute on object::' + @enqueue + N' to ' + @enqueuers + N';';
        exec sys.sp_executesql @sql;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
