-- The primary-key columns of a table, in key order, with their exact type text (length,
-- precision, scale, collation): what the per-feed outbox, feed and read type must hold.
--
-- Built from the catalog, not from sys.dm_exec_describe_first_result_set: the catalog is
-- certain to be usable inside a function, and that function returns no type name for CLR
-- types such as hierarchyid. max_length is in bytes, so n(var)char lengths are halved and
-- -1 means max. An alias type is written as its base type; system CLR types (hierarchyid,
-- geometry, geography) and sysname by their own names. A rowversion key is copied as
-- binary(8): a copy of it must not be stamped anew. problem is set for a column changefeed
-- cannot carry.
create or alter function [changefeed].[key_columns] (@object_id int)
returns table
as
return
with pk as (
    select
        ic.key_ordinal,
        c.name as column_name,
        c.max_length,
        c.[precision],
        c.scale,
        c.collation_name,
        t.is_user_defined,
        t.is_assembly_type,
        base.name as base_type
    from sys.indexes as i
    inner join sys.index_columns as ic
        on i.object_id = ic.object_id and i.index_id = ic.index_id
    inner join sys.columns as c
        on ic.object_id = c.object_id and ic.column_id = c.column_id
    inner join sys.types as t
        on c.user_type_id = t.user_type_id
    inner join sys.types as base
        on base.user_type_id = case
            when t.is_user_defined = 1 and t.is_assembly_type = 0 then t.system_type_id
            else t.user_type_id
        end
    where
        i.object_id = @object_id
        and i.is_primary_key = 1
        and ic.key_ordinal > 0
)

select
    key_ordinal,
    column_name,
    case
        when base_type in (N'varchar', N'char', N'varbinary', N'binary')
            then base_type + N'('
                + case when max_length = -1 then N'max' else convert(nvarchar(10), max_length) end
                + N')'
        when base_type in (N'nvarchar', N'nchar')
            then base_type + N'('
                + case when max_length = -1 then N'max' else convert(nvarchar(10), max_length / 2) end
                + N')'
        when base_type in (N'decimal', N'numeric')
            then base_type + N'(' + convert(nvarchar(3), [precision]) + N', '
                + convert(nvarchar(3), scale) + N')'
        when base_type in (N'datetime2', N'time', N'datetimeoffset')
            then base_type + N'(' + convert(nvarchar(3), scale) + N')'
        when base_type = N'float'
            then N'float(' + convert(nvarchar(3), [precision]) + N')'
        when base_type = N'timestamp'
            then N'binary(8)'
        else base_type
    end
    + case
        when collation_name is null then N''
        else N' collate ' + collation_name
    end as column_type,
    case
        when column_name in (N'shard_id', N'ulid', N'order_sequence', N'time_hint')
            then
                N'The key column ''' + column_name
                + N''' has the name of a column changefeed adds next to the key'
                + N' (shard_id, ulid, order_sequence, time_hint). Rename the column.'
        when charindex(N'__template', column_name collate Latin1_General_100_BIN2) > 0
            then
                N'The key column ''' + column_name
                + N''' contains ''__template'', which changefeed reserves. Rename the column.'
        when is_user_defined = 1 and is_assembly_type = 1
            then
                N'The key column ''' + column_name
                + N''' has a user-defined CLR type, which changefeed cannot copy into its'
                + N' outbox and feed. Use a key of built-in types.'
    end as problem
from pk;
