-- The procedures changefeed generates for one claim-style outbox table, with their quoted
-- names '[changefeed].[<kind>:<schema>.<table>]': the one place that spells them.
-- The inputs are parts already checked by changefeed.parse_feed_name.
-- Replaces V26's list, adding backlog (V79), so that upgrade_outbox and upgrade_all_feeds
-- generate it for every outbox.
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
    (N'held_aggregates'),
    (N'backlog')
) as k (kind);
