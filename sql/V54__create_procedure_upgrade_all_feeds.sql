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
--   * a claim outbox: its table is missing, or a column the template outbox has (and its
--     procedures name) is missing from it, renamed or dropped, or its name is one that
--     upgrade_outbox (V35's, which checks it as a feed's name) now refuses: 109 to 111
--     UTF-16 units, possible before V71 counted units; recorded in outboxes.problem.
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
        outer apply (
            select top (1) t.name as column_name
            from sys.columns as t
            where
                t.object_id = @template_outbox
                and not exists (
                    select 1
                    from sys.columns as c
                    where c.object_id = h.table_id and c.name = t.name
                )
            order by t.column_id
        ) as m
        -- The name as upgrade_outbox checks it (changefeed.check_table_name): registered
        -- names passed that check when they were set up, but V71 counts lengths in UTF-16
        -- units, and an outbox set up before it under an _SC collation may have 109 to 111.
        cross apply changefeed.parse_feed_name(o.schema_name + N'.' + o.table_name) as n
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
                    when m.column_name is not null
                        then
                            -- The catalog's name in the database's collation: in a partially
                            -- contained database sys.columns has the catalog's (Msg 468/457).
                            N'The column ' + quotename(m.column_name) collate database_default
                            + N' of the claim outbox '''
                            + o.schema_name + N'.' + o.table_name + N''', which its procedures'
                            + N' use, was renamed or dropped. Rename it back (exec sp_rename)'
                            + N' or add it again as setup_outbox creates it, then run exec'
                            + N' changefeed.upgrade_outbox @table_name = N'''
                            + replace(o.schema_name + N'.' + o.table_name, N'''', N'''''')
                            + N''';'
                    when n.problem is not null
                        then
                            N'The upgrade_outbox of this version refuses the name of the claim'
                            + N' outbox ''' + o.schema_name + N'.' + o.table_name
                            + N''', which it checks as a feed''s name, so its code was kept: '
                            + n.problem + N' A later upgrade_outbox, which finds an outbox by'
                            + N' its registered name, regenerates it.'
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
