-- (Replaces V54's.) What changed: an outbox that changefeed.outbox_problem finds broken (a
-- column its code names missing, every one of them named; an index its code names in hints
-- missing or reshaped) is skipped and reported, before anything is regenerated:
-- regenerating it would leave code that fails on every call (Msg 308), or scans where it
-- must seek, or fail here and roll the whole upgrade back. An outbox that lacks only
-- claim_expires_at is not broken: upgrade_outbox adds that column. upgrade_outbox finds an
-- outbox by its registered name, so a name of 109 to 111 UTF-16 units from before V71
-- (which V54's version had to skip) is regenerated too.
-- Regenerates the code of every registered feed and claim outbox from the current
-- templates, in one transaction. A migration that changes a template ends with
-- exec changefeed.upgrade_all_feeds.
--
-- One broken feed or outbox must not stop the upgrade of every other one, nor the migration
-- that runs this. Catching the failure is not enough: under SET XACT_ABORT ON (which every
-- procedure of the bundle sets) an error inside TRY leaves the transaction uncommittable
-- (XACT_STATE() = -1), and such a transaction can neither commit nor roll back to a
-- savepoint, only roll back whole, taking the caller's migration with it. So every defect
-- that would make a regeneration fail is looked for BEFORE regenerating, and the broken
-- object is skipped: its old code stays as it is, and its problem is recorded.
--   * a feed: changefeed.refresh_feed_status records feeds.problem (the event table dropped
--     or re-created, its shard or ULID column gone, its primary key changed since setup);
--   * a claim outbox: its table is missing, or changefeed.outbox_problem finds it broken (a
--     column the template outbox has and its procedures name is missing from it, renamed
--     or dropped; an index its procedures name in hints is missing or not as they need
--     it: the clustered index on (id), head_of_aggregate); recorded in outboxes.problem.
-- A defect of another kind still fails the whole upgrade, which then changes nothing.
--
-- Returns one row per feed and outbox: kind ('feed' or 'outbox'), name ('schema.table'),
-- upgraded (1, or 0 when skipped) and problem (why it was skipped and the statement that
-- fixes it; NULL when upgraded). feed_status shows a feed's problem; outboxes.problem keeps
-- an outbox's until the next upgrade finds it fixed.
create or alter procedure [changefeed].[upgrade_all_feeds]
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @table_name nvarchar(300);
    declare @template_outbox int = object_id(N'[changefeed].[__template_outbox__]', N'U');
    -- Returned once everything is committed.
    declare @report table (
        kind varchar(10) not null,
        name nvarchar(257) not null,
        upgraded bit not null,
        problem nvarchar(1000) null,
        position int identity (1, 1) not null primary key
    );

    if @template_outbox is null
        throw 51009, N'upgrade_all_feeds: the template outbox is missing. Re-apply the changefeed migrations.', 1;

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        -- Records each feed's problem (and rebuilds feed_status around the broken ones, so
        -- that upgrade_feed's own refresh below cannot fail on them).
        exec changefeed.refresh_feed_status;

        declare feeds_to_upgrade cursor local fast_forward for
        select schema_name + N'.' + table_name
        from changefeed.feeds
        where problem is null
        order by feed_id;

        open feeds_to_upgrade;
        fetch next from feeds_to_upgrade into @table_name;
        while @@fetch_status = 0
        begin
            exec changefeed.upgrade_feed @table_name = @table_name;
            fetch next from feeds_to_upgrade into @table_name;
        end;
        close feeds_to_upgrade;
        deallocate feeds_to_upgrade;

        insert into @report (kind, name, upgraded, problem)
        select
            'feed',
            schema_name + N'.' + table_name,
            convert(bit, case when problem is null then 1 else 0 end),
            problem
        from changefeed.feeds
        order by feed_id;

        -- Each outbox's problem. Only rows whose problem changed are written.
        update o
        set problem = p.problem
        from changefeed.outboxes as o
        cross apply (
            select
                object_id(quotename(o.schema_name) + N'.' + quotename(o.table_name), N'U')
                    as table_id
        ) as h
        -- Used only where the table exists (the case below tries that first).
        cross apply changefeed.outbox_problem(
            h.table_id, o.schema_name, o.table_name, o.native_json
        ) as x
        cross apply (
            -- Explicitly cut to the column's length: long names must not make the update
            -- fail on truncation (Msg 2628) and so fail the upgrade.
            select
                convert(nvarchar(1000), case
                    when h.table_id is null
                        then
                            N'The claim outbox table ''' + o.schema_name + N'.' + o.table_name
                            + N''' was dropped or renamed. Create it again (or rename it back):'
                            + N' exec changefeed.setup_outbox @table_name = N'''
                            + replace(o.schema_name + N'.' + o.table_name, N'''', N'''''')
                            + N''';'
                    else x.problem
                end) as problem
        ) as p
        where isnull(o.problem, N'') <> isnull(p.problem, N'');

        declare outboxes_to_upgrade cursor local fast_forward for
        select schema_name + N'.' + table_name
        from changefeed.outboxes
        where problem is null
        order by outbox_id;

        open outboxes_to_upgrade;
        fetch next from outboxes_to_upgrade into @table_name;
        while @@fetch_status = 0
        begin
            exec changefeed.upgrade_outbox @table_name = @table_name;
            fetch next from outboxes_to_upgrade into @table_name;
        end;
        close outboxes_to_upgrade;
        deallocate outboxes_to_upgrade;

        insert into @report (kind, name, upgraded, problem)
        select
            'outbox',
            schema_name + N'.' + table_name,
            convert(bit, case when problem is null then 1 else 0 end),
            problem
        from changefeed.outboxes
        order by outbox_id;

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;

    select
        kind,
        name,
        upgraded,
        problem
    from @report
    order by position;
end
