-- Rewrites changefeed.feed_status as the union of every registered feed's status view.
-- select * is deliberate: every status view is a copy of one of the two template views, which
-- have the same columns, so the arms of the union match by construction.
--
-- A feed whose status view cannot work is not put in the union, where it would break the view
-- for every feed (a view that names a dropped table fails as a whole). It gets one row with
-- its name and mode, NULL elsewhere, and problem saying what is wrong and how to fix it:
--   * the event table is missing (dropped or renamed): tear the feed down;
--   * another table has its name (dropped and re-created): tear down and set up again;
--   * serialized mode, its shard or ULID column is gone: tear down (and set up again);
--   * its primary key changed since setup (a key column renamed, added, dropped or retyped:
--     changefeed.feed_key_problem): restore the key, or tear down and set up again;
--   * its status view is missing: upgrade_feed regenerates it.
-- The problem is also recorded in changefeed.feeds.problem, where upgrade_all_feeds finds the
-- feeds to skip. The check runs when the view is generated: setup_feed, upgrade_feed,
-- teardown_feed and upgrade_all_feeds all call this procedure.
--
-- @only_if_changed = 1 records the problems and rebuilds the view only when one changed:
-- upgrade_all_feeds calls it once before it regenerates feed after feed (upgrade_feed
-- @refresh_status = 0 skips its own rebuild), so that an upgrade of N feeds does O(N) work
-- here instead of one whole rebuild per feed (O(N^2)). Regenerating a feed that has no
-- problem changes nothing this view reads: its status view keeps its name and the
-- template's columns (no status template changed since the first release), and the union
-- names it. So only a changed problem (a feed that broke or was repaired) needs a rebuild,
-- and an upgrade with nothing to do does not take the view's schema lock at all. Both
-- statements are linear in the number of feeds: one update, one string_agg. A view is bound when queried,
-- so an event table dropped later breaks feed_status (error 208 naming the table) until this
-- runs again: exec changefeed.refresh_feed_status; (README, "Status views").
create or alter procedure [changefeed].[refresh_feed_status]
    @only_if_changed bit = 0
as
begin
    set nocount, xact_abort on;
    -- This procedure commits its own transaction: with IMPLICIT_TRANSACTIONS ON (JDBC with
    -- autocommit off, pyodbc's default) its begin transaction would open two levels and its
    -- commit leave one open, with every lock held. The setting reverts when it returns.
    set implicit_transactions off;

    declare @template_status nvarchar(300) = N'[changefeed].[status:changefeed.__template__]';
    declare @problem_columns nvarchar(max);
    declare @sql nvarchar(max);
    declare @changed int;

    begin try
        begin transaction;
        -- Taken before the registry is read: a setup or teardown running at the same time
        -- must not commit a feed this text misses.
        exec changefeed.lock_generators;

        -- The select list of a problem row: the status columns in their order, feed and mode
        -- from the registry, every other column NULL of its type (the template's, joined on
        -- 1 = 0).
        select
            @problem_columns = string_agg(
                case
                    when c.name in (N'feed', N'mode')
                        then convert(nvarchar(max), N'b.') + quotename(c.name)
                    else convert(nvarchar(max), N't.') + quotename(c.name)
                end,
                N', '
            ) within group (order by c.column_id)
        from sys.columns as c
        where c.object_id = object_id(@template_status, N'V');

        if @problem_columns is null
            throw 51009, N'refresh_feed_status: the template status view is missing. Re-apply the changefeed migrations.', 1;

        -- Each feed's problem, recorded in the registry: upgrade_all_feeds skips these feeds.
        -- Only rows whose problem changed are written: the registry rows stay unlocked for
        -- save_cursor and load_cursor while the generator's transaction runs.
        update f
        set problem = p.problem
        from changefeed.feeds as f
        cross apply changefeed.feed_objects(f.schema_name, f.table_name) as o
        cross apply (
            select
                quotename(f.schema_name) + N'.' + quotename(f.table_name) as qualified_name,
                object_id(quotename(f.schema_name) + N'.' + quotename(f.table_name), N'U')
                    as event_table_id
        ) as h
        -- A changed primary key (no row when unchanged); the case below reports a missing
        -- or replaced table first.
        outer apply changefeed.feed_key_problem(f.object_id, f.schema_name, f.table_name) as k
        cross apply (
            select
                case
                    when h.event_table_id is null
                        then
                            N'The event table ''' + f.schema_name + N'.' + f.table_name
                            + N''' was dropped or renamed while it was a feed. Tear the feed down:'
                            + N' exec changefeed.teardown_feed @table_name = N'''
                            + f.schema_name + N'.' + f.table_name + N''';'
                    when h.event_table_id <> f.object_id
                        then
                            N'The event table ''' + f.schema_name + N'.' + f.table_name
                            + N''' was dropped and re-created since it became a feed. Tear the'
                            + N' feed down, then set it up again: exec changefeed.teardown_feed'
                            + N' @table_name = N''' + f.schema_name + N'.' + f.table_name + N''';'
                    when f.mode = 'serialize_writers'
                        and (
                            col_length(h.qualified_name, f.shard_column) is null
                            or col_length(h.qualified_name, f.ulid_column) is null
                        )
                        then
                            N'The shard column ''' + f.shard_column + N''' or the ULID column '''
                            + f.ulid_column + N''' of ''' + f.schema_name + N'.' + f.table_name
                            + N''' was dropped or renamed. Tear the feed down, then set it up'
                            + N' again: exec changefeed.teardown_feed @table_name = N'''
                            + f.schema_name + N'.' + f.table_name + N''';'
                    when k.problem is not null
                        then k.problem
                    when object_id(o.quoted_name, N'V') is null
                        then
                            N'The status view of ''' + f.schema_name + N'.' + f.table_name
                            + N''' is missing. Regenerate the feed''s code: exec'
                            + N' changefeed.upgrade_feed @table_name = N'''
                            + f.schema_name + N'.' + f.table_name + N''';'
                end as problem
        ) as p
        where o.kind = N'status' and isnull(f.problem, N'') <> isnull(p.problem, N'');
        set @changed = @@rowcount;

        if isnull(@only_if_changed, 0) = 0 or @changed > 0
        begin
            select
                @sql = N'create or alter view [changefeed].[feed_status] as select t.*,'
                    + N' convert(nvarchar(1000), null) as problem from ' + @template_status
                    + N' as t where 1 = 0'
                    + isnull(
                        string_agg(
                            case
                                when f.problem is null
                                    then
                                        convert(nvarchar(max), N' union all select s.*,')
                                        + N' convert(nvarchar(1000), null) as problem from '
                                        + o.quoted_name + N' as s'
                                else
                                    convert(nvarchar(max), N' union all select ') + @problem_columns
                                    + N', b.problem from (values (N'''
                                    + replace(f.schema_name + N'.' + f.table_name, N'''', N'''''')
                                    + N''', ''' + f.mode + N''', N'''
                                    + replace(f.problem, N'''', N'''''')
                                    + N''')) as b (feed, mode, problem) left outer join '
                                    + @template_status + N' as t on 1 = 0'
                            end,
                            N''
                        ) within group (order by f.feed_id),
                        N''
                    )
            from changefeed.feeds as f
            cross apply changefeed.feed_objects(f.schema_name, f.table_name) as o
            where o.kind = N'status';

            exec sys.sp_executesql @sql;
        end;
        commit transaction;
    end try
    begin catch
        if @@trancount > 0 rollback transaction;
        throw;
    end catch;
end
