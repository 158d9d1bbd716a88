-- Regenerates the code of every registered feed and claim outbox from the current
-- templates, in one transaction. A migration that changes a template ends with
-- exec changefeed.upgrade_all_feeds.
--
-- A feed that cannot be regenerated (its event table was dropped or re-created, or its shard
-- or ULID column is gone: changefeed.refresh_feed_status records that in feeds.problem) is
-- skipped, not allowed to stop the upgrade of every other feed in the database: its old code
-- stays as it is, and feed_status shows its problem. After it, every other feed runs the
-- current generator version.
--
-- Returns one row per feed and outbox: kind ('feed' or 'outbox'), name ('schema.table'),
-- upgraded (1, or 0 when skipped) and problem (why it was skipped and the statement that
-- fixes it; NULL when upgraded).
create or alter procedure [changefeed].[upgrade_all_feeds]
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @table_name nvarchar(300);
    -- Returned once everything is committed.
    declare @report table (
        kind varchar(10) not null,
        name nvarchar(257) not null,
        upgraded bit not null,
        problem nvarchar(1000) null,
        position int identity (1, 1) not null primary key
    );

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

        declare outboxes_to_upgrade cursor local fast_forward for
        select schema_name + N'.' + table_name
        from changefeed.outboxes
        order by outbox_id;

        open outboxes_to_upgrade;
        fetch next from outboxes_to_upgrade into @table_name;
        while @@fetch_status = 0
        begin
            exec changefeed.upgrade_outbox @table_name = @table_name;
            insert into @report (kind, name, upgraded, problem)
            values ('outbox', @table_name, 1, null);
            fetch next from outboxes_to_upgrade into @table_name;
        end;
        close outboxes_to_upgrade;
        deallocate outboxes_to_upgrade;

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
