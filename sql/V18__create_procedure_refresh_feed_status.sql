-- Rewrites changefeed.feed_status as the union of every registered feed's status view.
-- select * is deliberate: every status view is a copy of the one template, so the arms of the
-- union have the same columns by construction, and the first version of feed_status keeps the list in one place.
create or alter procedure [changefeed].[refresh_feed_status]
as
begin
    set nocount, xact_abort on;

    declare @sql nvarchar(max) = N'create or alter view [changefeed].[feed_status] as '
        + N'select * from [changefeed].[status:changefeed.__template__] where 1 = 0';

    select
        @sql = @sql + isnull(
            string_agg(
                convert(nvarchar(max), N' union all select * from ') + o.quoted_name, N''
            ) within group (order by f.feed_id),
            N''
        )
    from changefeed.feeds as f
    cross apply changefeed.feed_objects(f.schema_name, f.table_name) as o
    where o.kind = N'status' and object_id(o.quoted_name, N'V') is not null;

    exec sys.sp_executesql @sql;
end
