-- The procedures changefeed generates for one claim-style outbox table, with their quoted
-- names '[changefeed].[<kind>:<schema>.<table>]': the one place that spells them.
-- The inputs are parts already checked by changefeed.parse_feed_name.
create or alter function [changefeed].[outbox_objects] (
    @schema_name sysname,
    @table_name sysname
)
returns table
as
return
select
    k.kind,
    k.kind + N':' + @schema_name + N'.' + @table_name as object_name,
    quotename(N'changefeed') + N'.'
    + quotename(k.kind + N':' + @schema_name + N'.' + @table_name) as quoted_name
from (
    values
    (N'enqueue'),
    (N'claim'),
    (N'mark_done'),
    (N'mark_failed'),
    (N'requeue'),
    (N'purge_done'),
    (N'held_aggregates')
) as k (kind);
