-- Regenerates the code of every registered feed and claim outbox from the current
-- templates, in one transaction: after it, all run the same generator version or none
-- changed. A migration that changes a template ends with exec changefeed.upgrade_all_feeds.
create or alter procedure [changefeed].[upgrade_all_feeds]
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @table_name nvarchar(300);

    begin try
        begin transaction;
        exec changefeed.lock_generators;

        declare feeds_to_upgrade cursor local fast_forward for
        select schema_name + N'.' + table_name
        from changefeed.feeds
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

        declare outboxes_to_upgrade cursor local fast_forward for
        select schema_name + N'.' + table_name
        from changefeed.outboxes
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

        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
