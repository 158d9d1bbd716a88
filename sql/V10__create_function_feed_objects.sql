-- Every object changefeed creates for one feed, with its quoted name: the one place that
-- spells the per-feed names '[changefeed].[<kind>:<schema>.<table>]' and the role names
-- '[changefeed.writers:<schema>.<table>]' / '[changefeed.readers:<schema>.<table>]'.
-- object_class: P procedure, FN scalar function, V view, TT table type, U table,
-- R database role. drop_order lists code before the storage it uses.
-- mode: the feed mode that has the object ('outbox', 'serialize_writers', or 'both').
-- The inputs are parts already checked by changefeed.parse_feed_name.
create or alter function [changefeed].[feed_objects] (
    @schema_name sysname,
    @table_name sysname
)
returns table
as
return
select
    k.kind,
    k.object_class,
    k.drop_order,
    k.mode,
    k.kind + N':' + @schema_name + N'.' + @table_name as object_name,
    case
        when k.object_class = 'R' then quotename(k.kind + N':' + @schema_name + N'.' + @table_name)
        else
            quotename(N'changefeed') + N'.'
            + quotename(k.kind + N':' + @schema_name + N'.' + @table_name)
    end as quoted_name
from (
    values
    (N'read_feed', 'P', 1, 'both'),
    (N'purge_feed', 'P', 1, 'outbox'),
    (N'status', 'V', 2, 'both'),
    (N'lock_feed', 'P', 3, 'serialize_writers'),
    (N'ulid', 'FN', 4, 'serialize_writers'),
    (N'type:read', 'TT', 5, 'both'),
    (N'feed', 'U', 6, 'outbox'),
    (N'outbox', 'U', 7, 'outbox'),
    (N'state', 'U', 9, 'both'),
    (N'changefeed.writers', 'R', 10, 'both'),
    (N'changefeed.readers', 'R', 11, 'both')
) as k (kind, object_class, drop_order, mode);
