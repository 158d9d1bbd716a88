-- The primary-key columns of a table, in key order, with their exact type text (length,
-- precision, scale) and collation. sys.dm_exec_describe_first_result_set answers exactly what
-- a 'select <key columns>' returns, which is what the per-feed outbox, feed and read type
-- must hold; building the type text from sys.columns would have to redo its byte-length and
-- alias-type rules. A rowversion key is described as binary(8): a copy of it must not be
-- stamped anew. problem is set for a column changefeed cannot carry.
create or alter function [changefeed].[key_columns] (@object_id int)
returns table
as
return
with pk as (
    select
        ic.key_ordinal,
        c.name as column_name
    from sys.indexes as i
    inner join sys.index_columns as ic
        on i.object_id = ic.object_id and i.index_id = ic.index_id
    inner join sys.columns as c
        on ic.object_id = c.object_id and ic.column_id = c.column_id
    where
        i.object_id = @object_id
        and i.is_primary_key = 1
        and ic.key_ordinal > 0
),

probe as (
    select
        N'select '
        + string_agg(convert(nvarchar(max), quotename(column_name)), N', ')
            within group (order by key_ordinal)
        + N' from ' + quotename(object_schema_name(@object_id))
        + N'.' + quotename(object_name(@object_id)) as query_text
    from pk
)

select
    pk.key_ordinal,
    pk.column_name,
    case
        when d.system_type_name = N'timestamp' then N'binary(8)'
        else d.system_type_name
    end
    + case
        when d.collation_name is null then N''
        else N' collate ' + d.collation_name
    end as column_type,
    case
        when pk.column_name in (N'shard_id', N'ulid', N'order_sequence', N'time_hint')
            then
                N'The key column ''' + pk.column_name
                + N''' has the name of a column changefeed adds next to the key'
                + N' (shard_id, ulid, order_sequence, time_hint). Rename the column.'
        when charindex(N'__template', pk.column_name collate Latin1_General_100_BIN2) > 0
            then
                N'The key column ''' + pk.column_name
                + N''' contains ''__template'', which changefeed reserves. Rename the column.'
    end as problem
from pk
cross join probe
cross apply sys.dm_exec_describe_first_result_set(probe.query_text, null, 0) as d
where d.column_ordinal = pk.key_ordinal;
